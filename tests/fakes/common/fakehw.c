/* The shared fake hardware: see fakehw.h. */
#define _GNU_SOURCE
#include "fakehw.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void copy(char *dst, const char *src) {
    snprintf(dst, FH_NAME, "%s", src);
}

static int parse_line(fh_state *st, const char *line) {
    char kind[32], a[FH_NAME], b[FH_NAME], c[FH_NAME], rest[FH_NAME];
    if (sscanf(line, "%31s", kind) != 1 || kind[0] == '#') return 0;
    if (!strcmp(kind, "mode"))
        return sscanf(line, "mode %u %u", &st->mode_current, &st->mode_pending) == 2 ? 0 : -1;
    if (!strcmp(kind, "serial"))
        return sscanf(line, "serial %llu", &st->serial) == 1 ? 0 : -1;
    if (!strcmp(kind, "card") && st->ncards < FH_MAX_CARDS) {
        fh_card *x = &st->cards[st->ncards++];
        rest[0] = 0;
        if (sscanf(line, "card %u %u %u %u %llu %95s %95s %95s %95[^\n]", &x->index,
                   &x->mig_current, &x->mig_pending, &x->minor, &x->memory_mib, a, b, c,
                   rest) < 8)
            return -1;
        copy(x->model, a), copy(x->pci, b), copy(x->uuid, c), copy(x->name, rest);
        return 0;
    }
    if (!strcmp(kind, "profile") && st->nprofiles < FH_MAX_PROFILES) {
        fh_profile *x = &st->profiles[st->nprofiles++];
        rest[0] = 0;
        if (sscanf(line, "profile %u %u %u %u %u %u %llu %u %95[^\n]", &x->card, &x->probe,
                   &x->id, &x->slices, &x->mem_slices, &x->count, &x->memory_mb, &x->caps,
                   rest) < 8)
            return -1;
        copy(x->name, rest);
        return 0;
    }
    if (!strcmp(kind, "place") && st->nplaces < FH_MAX_PLACES) {
        fh_place *x = &st->places[st->nplaces++];
        return sscanf(line, "place %u %u %u %u", &x->card, &x->profile_id, &x->start,
                      &x->size) == 4 ? 0 : -1;
    }
    if (!strcmp(kind, "ciprofile") && st->nciprofiles < FH_MAX_CIPROFILES) {
        fh_ciprofile *x = &st->ciprofiles[st->nciprofiles++];
        return sscanf(line, "ciprofile %u %u %u %u", &x->card, &x->probe, &x->id,
                      &x->slices) == 4 ? 0 : -1;
    }
    if (!strcmp(kind, "gi") && st->ngis < FH_MAX_GIS) {
        fh_gi *x = &st->gis[st->ngis++];
        return sscanf(line, "gi %u %u %u %u %u", &x->card, &x->gi_id, &x->profile_id, &x->start,
                      &x->size) == 5 ? 0 : -1;
    }
    if (!strcmp(kind, "ci") && st->ncis < FH_MAX_CIS) {
        fh_ci *x = &st->cis[st->ncis++];
        if (sscanf(line, "ci %u %u %u %u %u %95s", &x->card, &x->gi_id, &x->ci_id,
                   &x->profile_id, &x->busy, a) != 6)
            return -1;
        copy(x->uuid, a);
        return 0;
    }
    if (!strcmp(kind, "fail") && st->nfails < FH_MAX_RULES) {
        fh_fail *x = &st->fails[st->nfails++];
        if (sscanf(line, "fail %95s %d %u", a, &x->code, &x->times) != 3) return -1;
        copy(x->function, a);
        return 0;
    }
    if (!strcmp(kind, "lag") && st->nlags < FH_MAX_RULES) {
        fh_lag *x = &st->lags[st->nlags++];
        if (sscanf(line, "lag %95s %u", a, &x->ms) != 2) return -1;
        copy(x->function, a);
        return 0;
    }
    if (!strcmp(kind, "quirk") && st->nquirks < FH_MAX_RULES) {
        fh_quirk *x = &st->quirks[st->nquirks++];
        if (sscanf(line, "quirk %95s %ld", a, &x->value) != 2) return -1;
        copy(x->name, a);
        return 0;
    }
    return -1; /* unknown record or a table is full: the file is not what the fake models */
}

fh_state *fh_begin(const char *env) {
    const char *path = getenv(env);
    if (path == NULL || *path == 0) return NULL;
    fh_state *st = calloc(1, sizeof(*st));
    if (st == NULL) return NULL;
    st->fd = open(path, O_RDWR | O_CLOEXEC);
    if (st->fd < 0) goto fail;
    if (flock(st->fd, LOCK_EX) != 0) goto fail;
    FILE *in = fdopen(dup(st->fd), "r");
    if (in == NULL) goto fail;
    char line[512];
    int bad = 0;
    while (fgets(line, sizeof(line), in) != NULL)
        if (parse_line(st, line) != 0) bad = 1;
    fclose(in);
    if (!bad) return st;
fail:
    if (st->fd >= 0) close(st->fd);
    free(st);
    return NULL;
}

static void write_state(const fh_state *st, FILE *out) {
    fprintf(out, "mode %u %u\nserial %llu\n", st->mode_current, st->mode_pending, st->serial);
    for (unsigned i = 0; i < st->ncards; i++) {
        const fh_card *x = &st->cards[i];
        fprintf(out, "card %u %u %u %u %llu %s %s %s %s\n", x->index, x->mig_current,
                x->mig_pending, x->minor, x->memory_mib, x->model, x->pci, x->uuid, x->name);
    }
    for (unsigned i = 0; i < st->nprofiles; i++) {
        const fh_profile *x = &st->profiles[i];
        fprintf(out, "profile %u %u %u %u %u %u %llu %u %s\n", x->card, x->probe, x->id,
                x->slices, x->mem_slices, x->count, x->memory_mb, x->caps, x->name);
    }
    for (unsigned i = 0; i < st->nplaces; i++)
        fprintf(out, "place %u %u %u %u\n", st->places[i].card, st->places[i].profile_id,
                st->places[i].start, st->places[i].size);
    for (unsigned i = 0; i < st->nciprofiles; i++)
        fprintf(out, "ciprofile %u %u %u %u\n", st->ciprofiles[i].card, st->ciprofiles[i].probe,
                st->ciprofiles[i].id, st->ciprofiles[i].slices);
    for (unsigned i = 0; i < st->ngis; i++)
        fprintf(out, "gi %u %u %u %u %u\n", st->gis[i].card, st->gis[i].gi_id,
                st->gis[i].profile_id, st->gis[i].start, st->gis[i].size);
    for (unsigned i = 0; i < st->ncis; i++)
        fprintf(out, "ci %u %u %u %u %u %s\n", st->cis[i].card, st->cis[i].gi_id,
                st->cis[i].ci_id, st->cis[i].profile_id, st->cis[i].busy, st->cis[i].uuid);
    for (unsigned i = 0; i < st->nfails; i++)
        if (st->fails[i].times > 0)
            fprintf(out, "fail %s %d %u\n", st->fails[i].function, st->fails[i].code,
                    st->fails[i].times);
    for (unsigned i = 0; i < st->nlags; i++)
        fprintf(out, "lag %s %u\n", st->lags[i].function, st->lags[i].ms);
    for (unsigned i = 0; i < st->nquirks; i++)
        fprintf(out, "quirk %s %ld\n", st->quirks[i].name, st->quirks[i].value);
}

int fh_end(fh_state *st, int dirty) {
    int rc = 0;
    if (dirty) {
        /* Rewritten in place under the lock: every reader takes the same lock first. */
        FILE *out = fdopen(dup(st->fd), "w");
        if (out == NULL || ftruncate(st->fd, 0) != 0 || lseek(st->fd, 0, SEEK_SET) != 0) rc = -1;
        if (out != NULL) {
            write_state(st, out);
            if (fflush(out) != 0 || fsync(fileno(out)) != 0) rc = -1;
            fclose(out);
        }
    }
    close(st->fd); /* releases the lock */
    free(st);
    return rc;
}

int fh_inject(fh_state *st, const char *function) {
    for (unsigned i = 0; i < st->nlags; i++) {
        if (strcmp(st->lags[i].function, function) != 0 || st->lags[i].ms == 0) continue;
        struct timespec ts = {st->lags[i].ms / 1000, (long)(st->lags[i].ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    for (unsigned i = 0; i < st->nfails; i++) {
        fh_fail *f = &st->fails[i];
        if (f->times > 0 && !strcmp(f->function, function)) {
            f->times--;
            return f->code;
        }
    }
    return 0;
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
        st->serial++;
        snprintf(salted, sizeof(salted), "%s#%llu", seed, st->serial);
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
