/* Shared "hardware" of the fake vendor libraries (HGML, DMI): partitionable cards whose state is
 * one text file, locked and re-read on every call, so that separate processes (the services, the
 * tests) drive one set of cards, and a test changes the hardware (busy instances, injected
 * failures, latencies) by editing the same file.
 *
 * Every symbol here is hidden: a fake loaded beside another fake (or beside the real NVML) must not
 * resolve its internals to the other library's.
 *
 * The file, one record a line (written by the tests' harness and by the fakes themselves):
 *   mode <current> <pending>                                   node-wide MIG mode (DMI)
 *   serial <n>                                                 counter for freshly issued ids
 *   card <index> <mig_current> <mig_pending> <minor> <memory_mib> <model> <pci> <uuid> <name...>
 *   profile <card> <probe> <id> <slices> <mem_slices> <count> <memory_mb> <caps> <name...>
 *   place <card> <profile_id> <start> <size>
 *   ciprofile <card> <probe> <id> <slices>
 *   gi <card> <gi_id> <profile_id> <start> <size>
 *   ci <card> <gi_id> <ci_id> <ci_profile_id> <busy> <uuid>
 *   fail <function> <code> <times>                              the next <times> calls fail
 *   lag <function> <ms>                                         every call sleeps first
 *   quirk <name> <value>                                        vendor-specific behaviours
 */
#ifndef PK_FAKEHW_H
#define PK_FAKEHW_H

#define FH_HIDDEN __attribute__((visibility("hidden")))

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
typedef struct { char function[FH_NAME]; int code; unsigned times; } fh_fail;
typedef struct { char function[FH_NAME]; unsigned ms; } fh_lag;
typedef struct { char name[FH_NAME]; long value; } fh_quirk;

typedef struct {
    int fd; /* the locked state file */
    unsigned mode_current, mode_pending;
    unsigned long long serial;
    unsigned ncards, nprofiles, nplaces, nciprofiles, ngis, ncis, nfails, nlags, nquirks;
    fh_card cards[FH_MAX_CARDS];
    fh_profile profiles[FH_MAX_PROFILES];
    fh_place places[FH_MAX_PLACES];
    fh_ciprofile ciprofiles[FH_MAX_CIPROFILES];
    fh_gi gis[FH_MAX_GIS];
    fh_ci cis[FH_MAX_CIS];
    fh_fail fails[FH_MAX_RULES];
    fh_lag lags[FH_MAX_RULES];
    fh_quirk quirks[FH_MAX_RULES];
} fh_state;

/* Lock the file named by the environment variable `env` and read it. Returns the state (heap, one
 * per call, so threads of one process exclude each other through their own lock) or NULL: no
 * variable, an unreadable or a malformed file. */
FH_HIDDEN fh_state *fh_begin(const char *env);
/* Write the state back (if `dirty`), unlock and free it. Returns 0 or -1. */
FH_HIDDEN int fh_end(fh_state *st, int dirty);
/* Sleep for the function's lag, then consume one injected failure: its code, or 0. Persisted by
 * fh_end, so the caller must end with dirty set when this returned non-zero. */
FH_HIDDEN int fh_inject(fh_state *st, const char *function);
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
