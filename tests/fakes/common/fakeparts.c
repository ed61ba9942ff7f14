/* The shared partitionable cards: see fakeparts.h. */
#define _GNU_SOURCE
#include "fakeparts.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void copy(char *dst, const char *src) {
    snprintf(dst, FH_NAME, "%s", src ? src : "");
}

static void pause_for(const fh_state *st, const char *fn) {
    for (unsigned i = 0; i < st->nlags; i++) {
        if (strcmp(st->lags[i].function, fn) != 0 || st->lags[i].ms == 0) continue;
        struct timespec ts = {st->lags[i].ms / 1000, (long)(st->lags[i].ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
}

int fh_begin(fake_session *s, const char *env, const char *fn) {
    int injected = fake_begin(s, getenv(env), sizeof(fh_state), FH_MAGIC, fn);
    if (injected < 0) return -1;
    pause_for(fh_state_of(s), fn);
    if (injected > 0) fh_end(s);
    return injected;
}

fh_state *fh_state_of(fake_session *s) {
    return (fh_state *)(void *)s->state;
}

void fh_end(fake_session *s) {
    fake_end(s, 1);
}

long fh_quirk_value(const fh_state *st, const char *name, long fallback) {
    for (unsigned i = 0; i < st->nquirks; i++)
        if (!strcmp(st->quirks[i].name, name)) return st->quirks[i].value;
    return fallback;
}

fh_card *fh_card_at(fh_state *st, unsigned index) {
    for (unsigned i = 0; i < st->ncards; i++)
        if (st->cards[i].index == index) return &st->cards[i];
    return NULL;
}

fh_profile *fh_profile_by_id(fh_state *st, unsigned card, unsigned id) {
    for (unsigned i = 0; i < st->nprofiles; i++)
        if (st->profiles[i].card == card && st->profiles[i].id == id) return &st->profiles[i];
    return NULL;
}

fh_profile *fh_profile_by_probe(fh_state *st, unsigned card, unsigned probe) {
    for (unsigned i = 0; i < st->nprofiles; i++)
        if (st->profiles[i].card == card && st->profiles[i].probe == probe)
            return &st->profiles[i];
    return NULL;
}

fh_ciprofile *fh_ciprofile_by_probe(fh_state *st, unsigned card, unsigned probe) {
    for (unsigned i = 0; i < st->nciprofiles; i++)
        if (st->ciprofiles[i].card == card && st->ciprofiles[i].probe == probe)
            return &st->ciprofiles[i];
    return NULL;
}

fh_ciprofile *fh_ciprofile_by_id(fh_state *st, unsigned card, unsigned id) {
    for (unsigned i = 0; i < st->nciprofiles; i++)
        if (st->ciprofiles[i].card == card && st->ciprofiles[i].id == id)
            return &st->ciprofiles[i];
    return NULL;
}

fh_gi *fh_gi_find(fh_state *st, unsigned card, unsigned gi_id) {
    for (unsigned i = 0; i < st->ngis; i++)
        if (st->gis[i].card == card && st->gis[i].gi_id == gi_id) return &st->gis[i];
    return NULL;
}

fh_ci *fh_ci_find(fh_state *st, unsigned card, unsigned gi_id, unsigned ci_id) {
    for (unsigned i = 0; i < st->ncis; i++)
        if (st->cis[i].card == card && st->cis[i].gi_id == gi_id && st->cis[i].ci_id == ci_id)
            return &st->cis[i];
    return NULL;
}

unsigned fh_ci_count(const fh_state *st, unsigned card, unsigned gi_id) {
    unsigned n = 0;
    for (unsigned i = 0; i < st->ncis; i++)
        n += st->cis[i].card == card && st->cis[i].gi_id == gi_id;
    return n;
}

int fh_legal(fh_state *st, unsigned card, unsigned profile_id, unsigned start, unsigned size) {
    for (unsigned i = 0; i < st->nplaces; i++) {
        const fh_place *p = &st->places[i];
        if (p->card == card && p->profile_id == profile_id && p->start == start && p->size == size)
            return 1;
    }
    return 0;
}

int fh_overlaps(const fh_state *st, unsigned card, unsigned start, unsigned size) {
    for (unsigned i = 0; i < st->ngis; i++) {
        const fh_gi *g = &st->gis[i];
        if (g->card == card && start < g->start + g->size && g->start < start + size) return 1;
    }
    return 0;
}

int fh_gi_add(fh_state *st, unsigned card, unsigned profile_id, unsigned start, unsigned size) {
    if (st->ngis >= FH_MAX_GIS) return -1;
    unsigned id = 1;
    while (fh_gi_find(st, card, id) != NULL) id++;
    st->gis[st->ngis++] = (fh_gi){card, id, profile_id, start, size};
    return (int)id;
}

int fh_ci_add(fh_state *st, unsigned card, unsigned gi_id, unsigned profile_id,
              const char *uuid) {
    if (st->ncis >= FH_MAX_CIS) return -1;
    unsigned id = 0;
    while (fh_ci_find(st, card, gi_id, id) != NULL) id++;
    fh_ci *x = &st->cis[st->ncis++];
    *x = (fh_ci){card, gi_id, id, profile_id, 0, ""};
    copy(x->uuid, uuid);
    return (int)id;
}

void fh_gi_remove(fh_state *st, unsigned card, unsigned gi_id) {
    for (unsigned i = 0; i < st->ngis; i++)
        if (st->gis[i].card == card && st->gis[i].gi_id == gi_id) {
            st->gis[i] = st->gis[--st->ngis];
            return;
        }
}

void fh_ci_remove(fh_state *st, unsigned card, unsigned gi_id, unsigned ci_id) {
    for (unsigned i = 0; i < st->ncis; i++)
        if (st->cis[i].card == card && st->cis[i].gi_id == gi_id && st->cis[i].ci_id == ci_id) {
            st->cis[i] = st->cis[--st->ncis];
            return;
        }
}

static unsigned long long fnv1a(const char *s, unsigned long long h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

void fh_uuid(fh_state *st, const char *seed, int fresh, char *out, unsigned size) {
    char salted[256];
    if (fresh) {
        /* Issued, not derived: unique across state files and processes, as a vendor's would be. */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        st->serial++;
        snprintf(salted, sizeof(salted), "%s#%llu#%ld#%ld.%ld", seed, st->serial, (long)getpid(),
                 (long)now.tv_sec, now.tv_nsec);
        seed = salted;
    }
    unsigned long long a = fnv1a(seed, 14695981039346656037ULL);
    unsigned long long b = fnv1a(seed, a ^ 0x9e3779b97f4a7c15ULL);
    snprintf(out, size, "%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32, (a >> 16) & 0xffff,
             0x5000 | (a & 0x0fff), 0x8000 | ((b >> 48) & 0x3fff), b & 0xffffffffffffULL);
}

int fh_mkdirs(const char *path) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}

void *fh_handle(unsigned kind, unsigned card, unsigned gi, unsigned ci) {
    uintptr_t v = ((uintptr_t)kind << 56) | ((uintptr_t)(card + 1) << 40) |
                  ((uintptr_t)(gi & 0xfffff) << 20) | (uintptr_t)(ci & 0xfffff);
    return (void *)v;
}

int fh_unhandle(const void *handle, unsigned kind, unsigned *card, unsigned *gi, unsigned *ci) {
    uintptr_t v = (uintptr_t)handle;
    if ((v >> 56) != kind || ((v >> 40) & 0xffff) == 0) return -1;
    *card = (unsigned)((v >> 40) & 0xffff) - 1;
    if (gi) *gi = (unsigned)((v >> 20) & 0xfffff);
    if (ci) *ci = (unsigned)(v & 0xfffff);
    return 0;
}

/* -- control entry points (tests/fakes/parts.py) --------------------------------------------- */

static fh_state *control(fake_session *s, const char *path) {
    if (fake_begin(s, path, sizeof(fh_state), FH_MAGIC, "control") < 0) return NULL;
    return fh_state_of(s);
}

int fake_parts_new(const char *path, const char *root) {
    fh_state *st = calloc(1, sizeof *st);
    if (st == NULL) return -1;
    snprintf(st->root, sizeof st->root, "%s", root ? root : "");
    int rc = fake_create(path, sizeof *st, FH_MAGIC, st);
    free(st);
    return rc;
}

int fake_parts_set_mode(const char *path, unsigned current, unsigned pending) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    st->mode_current = current;
    st->mode_pending = pending;
    fake_end(&s, 1);
    return 0;
}

int fake_parts_add_card(const char *path, unsigned mig_current, unsigned mig_pending,
                        unsigned minor, unsigned long long memory_mib, const char *pci,
                        const char *uuid, const char *name) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    if (st->ncards >= FH_MAX_CARDS) {
        fake_end(&s, 0);
        return -1;
    }
    unsigned index = st->ncards;
    fh_card *x = &st->cards[st->ncards++];
    *x = (fh_card){index, mig_current, mig_pending, minor, memory_mib, "", "", "", ""};
    copy(x->pci, pci), copy(x->uuid, uuid), copy(x->name, name);
    fake_end(&s, 1);
    return (int)index;
}

int fake_parts_add_profile(const char *path, unsigned card, unsigned probe, unsigned id,
                           unsigned slices, unsigned mem_slices, unsigned count,
                           unsigned long long memory_mb, unsigned caps, const char *name) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    if (st->nprofiles >= FH_MAX_PROFILES) {
        fake_end(&s, 0);
        return -1;
    }
    fh_profile *x = &st->profiles[st->nprofiles++];
    *x = (fh_profile){card, probe, id, slices, mem_slices, count, memory_mb, caps, ""};
    copy(x->name, name);
    fake_end(&s, 1);
    return 0;
}

int fake_parts_add_placement(const char *path, unsigned card, unsigned profile_id,
                             unsigned start, unsigned size) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    int ok = st->nplaces < FH_MAX_PLACES;
    if (ok) st->places[st->nplaces++] = (fh_place){card, profile_id, start, size};
    fake_end(&s, ok);
    return ok ? 0 : -1;
}

int fake_parts_add_ci_profile(const char *path, unsigned card, unsigned probe, unsigned id,
                              unsigned slices) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    int ok = st->nciprofiles < FH_MAX_CIPROFILES;
    if (ok) st->ciprofiles[st->nciprofiles++] = (fh_ciprofile){card, probe, id, slices};
    fake_end(&s, ok);
    return ok ? 0 : -1;
}

/* A process starts (1) or stops (0) holding the compute instance with this identity. */
int fake_parts_set_busy(const char *path, const char *uuid, unsigned busy) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    for (unsigned i = 0; i < st->ncis; i++)
        if (strcmp(st->cis[i].uuid, uuid) == 0) {
            st->cis[i].busy = busy;
            fake_end(&s, 1);
            return 0;
        }
    fake_end(&s, 0);
    return -1;
}

int fake_parts_lag(const char *path, const char *fn, unsigned ms) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    int ok = st->nlags < FH_MAX_RULES;
    if (ok) {
        st->lags[st->nlags] = (fh_lag){"", ms};
        copy(st->lags[st->nlags++].function, fn);
    }
    fake_end(&s, ok);
    return ok ? 0 : -1;
}

int fake_parts_quirk(const char *path, const char *name, long value) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    int ok = st->nquirks < FH_MAX_RULES;
    if (ok) {
        st->quirks[st->nquirks] = (fh_quirk){"", value};
        copy(st->quirks[st->nquirks++].name, name);
    }
    fake_end(&s, ok);
    return ok ? 0 : -1;
}

/* How many GPU instances (what = 0) or compute instances (1) exist on `card`. */
int fake_parts_count(const char *path, unsigned card, unsigned what) {
    fake_session s;
    fh_state *st = control(&s, path);
    if (st == NULL) return -1;
    int n = 0;
    if (what == 0)
        for (unsigned i = 0; i < st->ngis; i++) n += st->gis[i].card == card;
    else
        for (unsigned i = 0; i < st->ncis; i++) n += st->cis[i].card == card;
    fake_end(&s, 0);
    return n;
}
