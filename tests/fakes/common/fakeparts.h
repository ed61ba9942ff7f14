/* The partitionable cards the T-Head (HGML) and Hygon (DMI) fakes share, on the common fake state
 * (fakestate.h: one locked file per fake, failure injection, call counts, complaints).
 *
 * A card carries the GPU-instance profiles its vendor's library reports (id, the index a probe asks
 * by, compute and memory slices, name, capability bits), their legal placements, compute-instance
 * profiles, and the GPU and compute instances that exist. Beyond fakestate: a lag per entry point
 * (every call sleeps first) and named quirks for vendor behaviours a test switches on.
 *
 * Every helper here is hidden; the control entry points (fake_parts_*) are exported from each fake
 * under the same names, like fakestate's, and driven through tests/fakes/parts.py.
 */
#ifndef PK_FAKEPARTS_H
#define PK_FAKEPARTS_H

#include "fakestate.h"

#define FH_HIDDEN __attribute__((visibility("hidden")))
#define FH_MAGIC 0x50415254u /* "PART" */

#define FH_MAX_CARDS 16
#define FH_MAX_PROFILES 64
#define FH_MAX_PLACES 256
#define FH_MAX_CIPROFILES 64
#define FH_MAX_GIS 128
#define FH_MAX_CIS 128
#define FH_MAX_RULES 64
#define FH_NAME 96

typedef struct {
    unsigned index, mig_current, mig_pending, minor;
    unsigned long long memory_mib;
    char model[FH_NAME], pci[FH_NAME], uuid[FH_NAME], name[FH_NAME];
} fh_card;

typedef struct {
    unsigned card, probe, id, slices, mem_slices, count;
    unsigned long long memory_mb;
    unsigned caps;
    char name[FH_NAME];
} fh_profile;

typedef struct { unsigned card, profile_id, start, size; } fh_place;
typedef struct { unsigned card, probe, id, slices; } fh_ciprofile;
typedef struct { unsigned card, gi_id, profile_id, start, size; } fh_gi;
typedef struct { unsigned card, gi_id, ci_id, profile_id, busy; char uuid[FH_NAME]; } fh_ci;
typedef struct { char function[FH_NAME]; unsigned ms; } fh_lag;
typedef struct { char name[FH_NAME]; long value; } fh_quirk;

typedef struct {
    fake_header h;
    char root[256]; /* host root under which a fake keeps the driver's files ("": none) */
    unsigned mode_current, mode_pending, initialised;
    unsigned long long serial;
    unsigned ncards, nprofiles, nplaces, nciprofiles, ngis, ncis, nlags, nquirks;
    fh_card cards[FH_MAX_CARDS];
    fh_profile profiles[FH_MAX_PROFILES];
    fh_place places[FH_MAX_PLACES];
    fh_ciprofile ciprofiles[FH_MAX_CIPROFILES];
    fh_gi gis[FH_MAX_GIS];
    fh_ci cis[FH_MAX_CIS];
    fh_lag lags[FH_MAX_RULES];
    fh_quirk quirks[FH_MAX_RULES];
} fh_state;

/* One call of entry point `fn` on the state file named by the environment variable `env`: lock and
 * read it, count the call, sleep for the entry point's lag. Returns -1 without a (valid) file,
 * else the code of an injected failure (the call is then over: fh_end was done) or 0. */
FH_HIDDEN int fh_begin(fake_session *s, const char *env, const char *fn);
FH_HIDDEN fh_state *fh_state_of(fake_session *s);
/* Write the state back (always: the call counters changed) and unlock. */
FH_HIDDEN void fh_end(fake_session *s);
FH_HIDDEN long fh_quirk_value(const fh_state *st, const char *name, long fallback);

FH_HIDDEN fh_card *fh_card_at(fh_state *st, unsigned index);
FH_HIDDEN fh_profile *fh_profile_by_id(fh_state *st, unsigned card, unsigned id);
FH_HIDDEN fh_profile *fh_profile_by_probe(fh_state *st, unsigned card, unsigned probe);
FH_HIDDEN fh_ciprofile *fh_ciprofile_by_probe(fh_state *st, unsigned card, unsigned probe);
FH_HIDDEN fh_ciprofile *fh_ciprofile_by_id(fh_state *st, unsigned card, unsigned id);
FH_HIDDEN fh_gi *fh_gi_find(fh_state *st, unsigned card, unsigned gi_id);
FH_HIDDEN fh_ci *fh_ci_find(fh_state *st, unsigned card, unsigned gi_id, unsigned ci_id);
FH_HIDDEN unsigned fh_ci_count(const fh_state *st, unsigned card, unsigned gi_id);
FH_HIDDEN int fh_legal(fh_state *st, unsigned card, unsigned profile_id, unsigned start,
                       unsigned size);
FH_HIDDEN int fh_overlaps(const fh_state *st, unsigned card, unsigned start, unsigned size);
/* Create a GI (lowest free id from 1) or CI (lowest free from 0); return its id or -1 if full. */
FH_HIDDEN int fh_gi_add(fh_state *st, unsigned card, unsigned profile_id, unsigned start,
                        unsigned size);
FH_HIDDEN int fh_ci_add(fh_state *st, unsigned card, unsigned gi_id, unsigned profile_id,
                        const char *uuid);
FH_HIDDEN void fh_gi_remove(fh_state *st, unsigned card, unsigned gi_id);
FH_HIDDEN void fh_ci_remove(fh_state *st, unsigned card, unsigned gi_id, unsigned ci_id);
/* A UUID-shaped string: name-based (a hash of `seed`) when fresh is 0, else from the serial. */
FH_HIDDEN void fh_uuid(fh_state *st, const char *seed, int fresh, char *out, unsigned size);
/* mkdir -p of the directories above `path`. */
FH_HIDDEN int fh_mkdirs(const char *path);

/* Handles: opaque pointer values that encode what they name, so they stay valid across calls. */
enum { FH_DEVICE = 1, FH_MIG = 2, FH_GPU_INSTANCE = 3, FH_COMPUTE_INSTANCE = 4 };
FH_HIDDEN void *fh_handle(unsigned kind, unsigned card, unsigned gi, unsigned ci);
FH_HIDDEN int fh_unhandle(const void *handle, unsigned kind, unsigned *card, unsigned *gi,
                          unsigned *ci);

#endif
