/*
 * What every fake vendor library shares: its state in one file under an exclusive lock, so that
 * separate processes (a service, the test, a CLI) see one card; failure injection and call
 * counting through that file; and a place to record an argument the real library would have
 * crashed on or rejected.
 *
 * A fake's state is a struct that begins with a fake_header, and its size is fixed at compile
 * time. Every entry point of the fake does:
 *
 *     fake_session s;
 *     rc = fake_begin(&s, getenv("FAKE_<LIB>_STATE"), sizeof(my_state), MY_MAGIC, "fnName");
 *     ... read and change s.state ...
 *     fake_end(&s, dirty);
 *
 * fake_begin counts the call and returns the code of an injected failure (or 0), so a fake maps
 * that code onto the vendor's return type. The control functions (fake_fail, fake_calls,
 * fake_complaints, fake_create) are exported from every fake under these same names; tests drive
 * them through tests_support.clib.FakeLibrary (also fake_clear).
 */
#ifndef FAKESTATE_H
#define FAKESTATE_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_MAX_RULES 32
#define FAKE_MAX_COUNTERS 96
#define FAKE_NAME 64
#define FAKE_COMPLAINT 512

typedef struct {
    char fn[FAKE_NAME]; /* the entry point, exactly as exported ("*" for every one) */
    int code;           /* the vendor return code to answer with */
    int times;          /* how many more calls fail; -1 forever */
    int skip;           /* calls to let through before the first failure */
} fake_rule;

typedef struct {
    char fn[FAKE_NAME];
    unsigned count;
} fake_counter;

typedef struct {
    uint32_t magic;
    uint32_t size;
    fake_rule rules[FAKE_MAX_RULES];
    fake_counter calls[FAKE_MAX_COUNTERS];
    unsigned complaints;
    char last_complaint[FAKE_COMPLAINT];
} fake_header;

typedef struct {
    int fd;
    fake_header *state; /* the whole state, header first */
    size_t size;
} fake_session;

/* Lock and read the state file named by `path`. Returns -1 when it is missing or of another
 * layout (the fake then answers as the vendor does with no driver loaded), otherwise the code of
 * an injected failure for `fn`, or 0. */
int fake_begin(fake_session *s, const char *path, size_t size, uint32_t magic, const char *fn);
/* Write the state back when `dirty`, unlock, free. */
void fake_end(fake_session *s, int dirty);
/* Record that the caller passed what the real library would crash on or reject. */
void fake_complain(fake_header *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether `n` bytes at `p` can be read, found without touching them (no segfault). */
int fake_readable(const void *p, size_t n);

/* Control entry points, exported by every fake. `path` is the state file. */
int fake_create(const char *path, size_t size, uint32_t magic, const void *initial);
int fake_fail(const char *path, const char *fn, int code, int times, int skip);
int fake_calls(const char *path, const char *fn); /* fn "*": the sum over every entry point */
int fake_complaints(const char *path, char *buf, size_t len);
int fake_clear(const char *path); /* disarm every injected failure */

#endif
